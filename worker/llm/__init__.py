"""Language-model calls, for the `llm` node and the repair flow's `llm` generator: which provider a model name goes
to, one client per provider and endpoint per process, what a provider's error means for a batch, and the offline
fake (`"model": "fake"`), which answers only when named. May import `ir` and `worker.settings`; never
`worker.cluster`, `worker.engine` or `scheduler`."""
