"""moerag: the Python client (moerag.client); the service itself lives in app/, engine/, index/, kernels/."""
