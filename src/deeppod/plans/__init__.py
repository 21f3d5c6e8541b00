"""Resource plans as stored and shown: apply a plan, read it back with per-tenant usage."""
