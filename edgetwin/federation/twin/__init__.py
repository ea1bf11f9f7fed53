"""The federated twin fit: one `Twin` learned across sites whose raw logs never leave them.

* `edgetwin.federation.twin.fit`: the coordinator's side (rounds, phases, assembling the `Twin`)
  and each site's computation on its own rows (`SiteFitter`).
* `edgetwin.federation.twin.gan`: GAN-SMMSG's population game, played round by round across sites.
* `edgetwin.federation.twin.mail`: MAIL-MMSG's behaviour cloning and adversarial rounds across sites.
* `edgetwin.federation.twin.messages`: the ``twin_task`` / ``twin_update`` messages and their schema.
* `edgetwin.federation.twin.runner`: running the coordinator and the sites over a bus.

What leaves a site, and what an observer of the bus or the coordinator can learn from it:
docs/federation.md.
"""
