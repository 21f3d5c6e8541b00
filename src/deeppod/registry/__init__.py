"""Model registry: versions with lineage, aliases, evaluation, champion/challenger."""
