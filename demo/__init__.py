"""The end-to-end demo: every service of the KV-cache pool control plane on one machine, replaying the Mooncake
FAST'25 trace (``python -m demo``, ``make demo``). Modules:

* ``cli`` — the command line and the run (services, registry, agents, replay, verdict, shutdown);
* ``procs`` — child processes in their own process groups, stopped as groups;
* ``scenario`` — the registry it seeds through the REST API, and the routing of trace requests;
* ``replay`` — time-compressed replay into the agents' queues, and the lookups it expects;
* ``summary`` — per-namespace numbers from the REST API and the table;
* ``probe`` — the isolation check on the real Store (a subprocess);
* ``screenshot`` — the occupancy page in headless Chromium;
* ``settings`` / ``setup_db`` — Django settings and database set-up of a demo run;
* ``engine`` — real vLLM engines: the engine environment, the tiny model, instances started from instance
  directories, prompts from the trace;
* ``engine_demo`` / ``engine_scenario`` / ``store_probe`` — ``--engine vllm``: the walk with real engines and its
  checks, its registry and load, and which keys a tenant's Store holds (a subprocess).
"""
