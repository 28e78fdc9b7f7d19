"""Actors: the policy room and one sub-room per process made of pykka actors (scheduler,
runner, producers, embedding pool, simulator)."""
