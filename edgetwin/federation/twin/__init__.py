"""The federated twin fit: one `Twin` learned across sites whose raw logs never leave them.

* `edgetwin.federation.twin.fit`: the phases and what travels in each; gathers the public names of
  `plan` (`FitOptions`, `TwinFitPlan`), `site` (`SiteFitter`: each site's computation on its own
  rows), `assemble` (`TwinAssembler`: the coordinator's side), `clusters` / `columns` (what both
  sides compute identically), `candidates` / `personalise` (a site's personalised copy).
* `edgetwin.federation.twin.agents`: the k-agent rule's unit (`effective_agents`) and the rows a
  site may release (`released_rows`).
* `edgetwin.federation.twin.gan`: GAN-SMMSG's population game, played round by round across sites.
* `edgetwin.federation.twin.mail`: MAIL-MMSG's behaviour cloning and adversarial rounds across sites.
* `edgetwin.federation.twin.messages`: the ``twin_task`` / ``twin_update`` messages and their schema.
* `edgetwin.federation.twin.runner`: running the coordinator and the sites over a bus.

What leaves a site, and what an observer of the bus or the coordinator can learn from it:
docs/federation.md.
"""
