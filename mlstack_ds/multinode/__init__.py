"""Several nodes: hostfiles, ssh/scp to the nodes, and what the commands do across them."""
