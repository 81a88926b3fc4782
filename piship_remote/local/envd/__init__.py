"""The local service's envd: the process and filesystem RPCs, the watchers, ``/files``."""
