"""The producer processes (extract, nataraj, gana-cron, background-gana): their logic, their
actor host, and the results store they write."""
