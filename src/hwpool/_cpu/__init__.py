"""The CPU pool: persistent workers, row-parallel jobs and the shared cursor."""
