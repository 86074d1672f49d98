"""Jobs that outlive the terminal (issue 24): the per-user job table, and (to come) the
supervisor that runs the jobs, their logs, dependencies and time limits.

``_model`` is what a job is (its states, its id, its checked fields); ``_state`` where a
user's job files live and the rules for trusting them; ``_schema`` the table's schema and
its version; ``_store`` the job table itself (``JobStore``), in sqlite. Nothing here is
public yet: the commands and ``hwpool.submit`` will come on top. See docs/jobs.md.
"""
