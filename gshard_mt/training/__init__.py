"""Training: `setup` (state, mesh, shardings), `optimizer`, `step` (loss and update), `loop`, `checkpoint`,
`metrics`."""
