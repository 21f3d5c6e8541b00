"""Model registry: models and their versions with lineage, aliases, evaluation, champion/challenger."""
