"""`assay serve --executor ray`: a router deployment (the HTTP routes) in front of engine replicas on Ray Serve,
losing no request when a replica dies. deployment.py builds and runs it; router.py, remote.py, watch.py and
exchange.py are the router's; engine_replica.py the engines'; metrics_board.py sums their /metrics."""
