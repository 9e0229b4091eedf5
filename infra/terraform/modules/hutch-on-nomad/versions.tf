terraform {
  required_version = ">= 1.5"
  required_providers {
    nomad = {
      source = "hashicorp/nomad"
      # nomad_dynamic_host_volume (Nomad >= 1.10) arrived in 2.5.
      version = ">= 2.5, < 3.0"
    }
  }
}
