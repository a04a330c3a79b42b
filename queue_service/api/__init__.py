"""The edge: what turns a gRPC or browser call into an engine call, and its answer back.

- `road/`: the one road every call takes on either listener (deadline budget, gate, authorization,
  request checks, error mapping, span outcome) and the two transports' wrappers around it.
- `access/`: who the caller is (credentials, per-user assertions, TLS, their reload) and how long
  a stream may outlive them.
- `servicers/`: the gRPC services and their adapters (validation, proto conversion, page tokens).
- `listeners/`: the browser listener (hosts, limits) and the gRPC listener's connection limits.
"""
