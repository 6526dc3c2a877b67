"""Where a study lives: Optuna storages (SQLite in WAL mode, PostgreSQL) opened for several
writers, the storage format (every user-attr key), the study folder's lock. Storage only stores:
it settles nothing of the plan."""
