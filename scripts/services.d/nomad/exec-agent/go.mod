module hutch.invalid/exec-agent

go 1.24
