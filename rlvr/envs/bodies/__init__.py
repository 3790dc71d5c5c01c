"""Tool bodies: what each built-in tool does, as plain functions that run in the sandbox under
the tool's grant (``rlvr.envs.grants.run_granted`` ships a body's module source into the job).

A body module imports only the standard library (the sandbox cannot read rlvr's checkout), takes
the model's arguments and the environment's trusted context as keywords, returns the result text,
and raises ``ValueError`` with the message the model sees (after ``error: TOOL: ``).
"""
