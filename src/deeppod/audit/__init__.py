"""The audit log: every mutating API call and every failed sign-in, kept for a retention."""
