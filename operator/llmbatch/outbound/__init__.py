"""Outgoing calls the platform makes for tenants, through one address guard
(:mod:`llmbatch.outbound.guard`): webhook deliveries and remote media fetches."""
