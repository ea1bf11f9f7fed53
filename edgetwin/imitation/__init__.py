"""MAIL-MMSG and the behaviour-cloning baseline: how service groups respond."""
