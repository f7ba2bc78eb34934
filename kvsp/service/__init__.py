"""What every KVSP service process shares, below both the relay and the HTTPS roles (D9).

`config` (the role's TOML: server, TLS files, policy), `tls` (mutual TLS 1.3 contexts), `policy` (D2:
identities, scope grants, `publish_for`, quotas), `metrics` (one Prometheus registry per process),
`app` (the aiohttp application keys every role shares, e.g. health facts) and `tokens` (the D3 token
issuer keys). Import the modules themselves; this package face re-exports nothing.
"""
