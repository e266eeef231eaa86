"""Each step's building blocks: keys, keystreams, pads, packing, sampling, PRAM. Imports: the floor."""
