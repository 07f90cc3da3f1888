"""Models a run starts from: the embedded default, built here because nothing is downloaded at run time
(`default`), and named pretrained models prepared offline from a wheel (`named`;
`python -m agentrl.models` runs its command line)."""
