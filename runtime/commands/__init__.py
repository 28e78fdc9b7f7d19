"""runtime/commands"""
