"""The scheduler process: the front (client ROUTER), the host around the pure scheduler
core, the runner link, the job journal."""
