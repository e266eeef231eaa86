"""gRPC protocol definitions (package securerelease.v1) and committed generated modules."""
