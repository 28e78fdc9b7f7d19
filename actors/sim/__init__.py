"""The policy simulator: workload traces replayed against a policy on a simulated clock, and
the policy decision benchmark."""
