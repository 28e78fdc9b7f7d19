"""actors/policy"""
