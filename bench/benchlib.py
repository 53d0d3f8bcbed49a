"""What the Python benches share: a moto server, and granary nodes over it on loopback."""
import os, socket, subprocess, time
import boto3, requests

CREDS = dict(AWS_ACCESS_KEY_ID="t", AWS_SECRET_ACCESS_KEY="t", AWS_REGION="us-east-1",
             AWS_EC2_METADATA_DISABLED="true")


def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def start_moto(moto_bin, bucket="dsets"):
    """A moto server with `bucket` made: (process, url, boto3 client)."""
    mp = port()
    proc = subprocess.Popen([moto_bin, "-p", str(mp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{mp}"
    s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id="t", aws_secret_access_key="t",
                      region_name="us-east-1")
    for _ in range(300):
        try:
            s3.create_bucket(Bucket=bucket); break
        except Exception:
            time.sleep(0.05)
    return proc, url, s3


def wait_healthy(url, tries=400):
    for _ in range(tries):
        try:
            if requests.get(f"{url}/_granary/health", timeout=1).status_code == 200:
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} never answered health")


def start_node(granary_bin, data_dir, s3_url, *extra, listen_port=None, log=None):
    """A node over the S3 backend at `s3_url`: (process, url). Waits for health unless
    it is one of a cluster still starting (`wait=False` callers use wait_healthy)."""
    gp = listen_port or port()
    os.makedirs(data_dir, exist_ok=True)
    proc = subprocess.Popen(
        [granary_bin, "serve", "--listen", f"127.0.0.1:{gp}", "--data-dir", data_dir,
         "--backend", "s3", "--s3-endpoint", s3_url, *extra],
        env=dict(os.environ, **CREDS), stdout=subprocess.DEVNULL,
        stderr=open(log or f"{data_dir}.log", "w"))
    return proc, f"http://127.0.0.1:{gp}"
