"""The contracts of Relay's workflows: the typed values that cross between the gateway, the workflows and the
activities, and a typed stub of every activity, so workflows call activities by reference.

One module per workflow (``lifecycle``, ``retention``, ``gateway_watch``) and ``common`` for what they share.
Pure dataclasses and stubs, so the workflow sandbox can import them. Payload shapes are part of every recorded
history: new fields get defaults, and no field is renamed or retyped into another JSON shape.

Their annotations are types, evaluated when each class is defined: no module here, nor ``core.types`` (whose
dataclasses they carry), has ``from __future__ import annotations``, and no annotation is a quoted name. Pydantic
(the data converter) resolves a dataclass's annotations written as names in the namespace of its module, looked up
in ``sys.modules`` when it first builds that type's decoder; inside the workflow sandbox that is the sandbox's own
module table, which holds only the modules imported there by name and those lazily passed through. Under the
SDK's stock sandbox ``core.types`` is neither, so ``ExecutorInfo``'s ``Any`` could not be resolved and every
payload carrying one failed to decode ("not fully defined"), unless the process had already built that decoder
elsewhere (``core.temporal`` shares them): one import or test order worked, another did not
(``tests/workflows/test_contract_decoding.py``).
"""
