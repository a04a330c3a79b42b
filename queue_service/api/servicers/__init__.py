"""The gRPC services (queue, core callbacks, credits, operator, health) and their adapters:
request validation, conversion to and from the protos, and opaque page tokens."""
