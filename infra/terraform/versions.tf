terraform {
  required_version = ">= 1.5"
  required_providers {
    nomad = {
      source = "hashicorp/nomad"
      # Checked with v2.6.1 (scripts/tofu builds that one); any 2.x from 2.6 on.
      version = "~> 2.6"
    }
  }
}
