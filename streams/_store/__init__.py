"""What a store is made of: the hook records and protocol, the records a store keeps, the rules
written once over a record view, and ``MemoryStore``. Published for store authors as
:mod:`streams.store`.
"""
