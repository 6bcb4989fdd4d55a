import os
import tempfile

# Every test session gets its own compile cache, so tests never see artifacts of another run.
os.environ.setdefault("ROCMC_CACHE_DIR", tempfile.mkdtemp(prefix="rocmc-test-cache-"))
