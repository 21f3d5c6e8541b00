"""Carries out the scheduler's decisions: local processes (default) behind one small interface."""
