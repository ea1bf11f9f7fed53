"""The edge side: the emulated cluster, agents, the bus, federated aggregation, registry, runtime."""
