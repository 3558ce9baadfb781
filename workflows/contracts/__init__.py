"""The contracts of Relay's workflows: the typed values that cross between the gateway, the workflows and the
activities, and a typed stub of every activity, so workflows call activities by reference.

One module per workflow (``lifecycle``, ``retention``, ``gateway_watch``) and ``common`` for what they share.
Pure dataclasses and stubs, so the workflow sandbox can import them. Payload shapes are part of every recorded
history: new fields get defaults, and no field is renamed or retyped into another JSON shape.
"""
