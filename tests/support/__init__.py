"""Code the tests lend the app through its public seams (job kinds named in the config, ...)."""
