"""The decider (decide/evolve per schedule aggregate) and the command client."""
