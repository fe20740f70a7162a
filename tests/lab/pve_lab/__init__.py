"""The llmgw.fleet lab: a Proxmox VE API on loopback whose VMs boot as real nodes on this machine."""
