"""The maintenance services: one module per concern of the sweeper's pass (as River's
maintenance services and Oban's plugins), each with its batch size, all run by the sweeper
(`engine/sweeper.py`) on one supervised loop (`background.SupervisedLoop`). `service` says what a
service is; `ports` what they ask of the engine."""
