"""The shared layer under the three roles: TLS identities and authorization, PKI, retries,
config, logging, durable files, health checking, error-to-status mapping and the wire (the only
place where protobuf messages become domain values and back).

Roles (curator/, server/, researcher/) import ``mechanism``, ``protos`` and this package, never
each other and never the composition root (``secure_release``'s commands).
"""
