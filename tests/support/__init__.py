"""Helpers of the test suite, by job (process and deployment plumbing shared with benchmarks, the demo
and ``kvsp up`` lives in `control.deploy`):

- `tests.support.servers`: role servers in the test process (mutual TLS on loopback), a fake clock;
- `tests.support.vectors`: the spec's Appendix A values and tests/vectors/;
- `tests.support.client_doubles`: holder and IS doubles for the client tests;
- `tests.support.holder`: descriptors, containers, block ids and an IS double for the holder tests;
- `tests.support.instance`: the instance tests' deployment in one loop (real IS, holders, instances);
- `tests.support.instance_moqt`: the same with MOQT listeners, gated engines and slow holders;
- `tests.support.relay`: relays, publishers and subscribers; also the child process of relay tests.
"""
