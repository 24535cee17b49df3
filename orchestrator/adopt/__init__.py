"""``orchestrate init --from launcher.sh``: a profile from the launcher a user already has
(``build.adopt``)."""
