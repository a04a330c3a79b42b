"""Who may call: the credentials file and roles (auth.py), per-user assertions, the listener's
TLS, reloading both without a restart, and ending a stream whose caller lost access."""
