"""Reading fio's JSON output, shared by the bench report scripts."""
import json


def load_job(path):
    """The first job of a fio JSON output file (fio may print warnings
    before the JSON), or None if the file is missing or unreadable."""
    try:
        txt = open(path).read()
        return json.loads(txt[txt.index("{"):])["jobs"][0]
    except Exception:
        return None


def summarize(job):
    """IOPS, MB/s, p99 latency (us), bytes, seconds and error of a job,
    read and write together."""
    iops = bw = nbytes = 0.0
    p99 = 0.0
    for d in ("read", "write"):
        x = job[d]
        if x["io_bytes"] == 0:
            continue
        iops += x["iops"]
        bw += x["bw_bytes"]
        nbytes += x["io_bytes"]
        pct = x.get("clat_ns", {}).get("percentile", {})
        p99 = max(p99, pct.get("99.000000", 0) / 1000.0)
    return {"iops": iops, "mbs": bw / 1e6, "p99": p99, "bytes": nbytes,
            "secs": job.get("job_runtime", job.get("elapsed", 0) * 1000) / 1000.0, "err": job.get("error", 0)}
