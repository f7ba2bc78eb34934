"""``kvsp up``: the whole system on loopback in one command (supervised role processes, a front end,
a workload and its report); ``kvsp workload``: the workload against a running system.

Modules: `layout` (run directory, PKI, policy, role configs, written with `control.deploy.configs`),
`workload`
(the request mix, sans-I/O, and its HTTP runner), `scrape` (Prometheus samples across restarts),
`report` (figures, table, report.json, plots), `main` (the commands).  The processes run under
`control.deploy.supervisor`.
"""
