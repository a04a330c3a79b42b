"""The call's road: one `CallRoad.call` that both transports wrap (interceptor.py for gRPC,
web_road.py for Connect and gRPC-Web), with the gate, the request limits, the span outcome and
the mapping from domain errors to a status."""
