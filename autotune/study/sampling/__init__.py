"""The sampler the loop asks (`sampler.make_sampler`), and the effects sampler's own parts:
`effects` (sampler=auto's choice of the next trial), `points` (the space's settings as
points), `guess` (the expert's first guess and the batch ladder), `model` (the effects model),
`neighbourhood`. What a trial costs on the clock is the loop's too (`study.cost`)."""
