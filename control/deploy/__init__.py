"""Process and deployment plumbing shared by ``kvsp up``, the demo, the benchmarks and the tests.

- `control.deploy.ports`: free TCP/UDP ports on loopback, the port of a base URI;
- `control.deploy.environment`: the environment of role child processes;
- `control.deploy.pki`: a dev PKI of named roles (on `kvsp.pki`) with clients by identity;
- `control.deploy.configs`: typed role-config and policy writers (TOML that ``kvsp serve`` reads);
- `control.deploy.processes`: ``kvsp serve`` children: start, wait until listening, stop;
- `control.deploy.supervisor`: a supervised group of role processes (restart after a crash);
- `control.deploy.system`: a whole system of real role processes and a front end that follows sessions.

The package face re-exports nothing: import from the module that does the job.
"""
