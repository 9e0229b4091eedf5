variable "role" {
  description = "server or client."
  type        = string
  validation {
    condition     = contains(["server", "client"], var.role)
    error_message = "role must be server or client."
  }
}

variable "datacenter" {
  type = string
}

variable "server_ips" {
  type = list(string)
}

variable "artifact_base_url" {
  description = "Base URL holding nomad and hutch-containerd binaries (linux/amd64)."
  type        = string
}

variable "nomad_version" {
  type    = string
  default = "v1.10.0"
}

variable "workspace_root" {
  description = "Host directory of the sandboxes' workspaces on clients."
  type        = string
  default     = "/var/lib/hutch/nomad-workspaces"
}

variable "cluster_cidrs" {
  description = "The cluster's private networks (Nomad servers, registry, Kafka, PostgreSQL, API hosts): no sandbox reaches them, whatever its network.allow says."
  type        = list(string)
  default     = []
}

variable "insecure_registries" {
  description = "Registries (host:port) clients pull from over plain HTTP; one on loopback always is."
  type        = list(string)
  default     = []
}

variable "acl_enabled" {
  type    = bool
  default = true
}

variable "node_agents" {
  description = "Clients run the hutch node agent (hutch-on-nomad's hutch-node system job): raw_exec on, which Nomad's servers allow in the hutch-system namespace only (hutch-on-nomad sets the namespaces' task drivers: apply it before any token other than a management one exists). false: raw_exec off and denied."
  type        = bool
  default     = true
}

variable "name" {
  description = "The node's name in Nomad (default: the host name)."
  type        = string
  default     = ""
}

variable "data_dir" {
  type    = string
  default = "/var/lib/nomad"
}

variable "bind_addr" {
  type    = string
  default = "{{ GetPrivateIP }}"
}

variable "log_level" {
  type    = string
  default = "INFO"
}

variable "http_port" {
  description = "The agents' HTTP port; RPC and Serf are the next two."
  type        = number
  default     = 4646
}

variable "min_heartbeat_ttl" {
  type    = string
  default = "10s"
}

variable "heartbeat_grace" {
  type    = string
  default = "10s"
}

variable "failover_heartbeat_ttl" {
  type    = string
  default = "5m"
}

variable "plugin_dir" {
  type    = string
  default = "/opt/nomad/plugins"
}

variable "containerd_address" {
  type    = string
  default = "/run/containerd/containerd.sock"
}

variable "network_interface" {
  description = "The client's interface for allocations' addresses (default: Nomad's choice)."
  type        = string
  default     = ""
}

variable "cgroup_parent" {
  description = "The client's cgroup parent (default: Nomad's); several clients on one host need one each."
  type        = string
  default     = ""
}
