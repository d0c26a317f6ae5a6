"""The cluster under faults: workers SIGKILLed or paused, hosts cut off, Redis and brokers away."""
