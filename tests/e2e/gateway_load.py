"""A bounded load on the gateway: a fixed number of OpenAI requests from a few concurrent clients on loopback,
stopping by itself at that count or a time limit. Each request is recorded with when it was sent and answered,
its status, the replica that answered (the gateway's ``X-Llmgw-Replica`` header) and, for a failure, why."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Dict, List, Optional


class Load:
    def __init__(self, port: int, key: str, model: str, clients: int = 3, total: int = 300,
                 max_seconds: float = 300.0, pause: float = 0.05, max_tokens: int = 4, host: str = "127.0.0.1"):
        self.port, self.key, self.model, self.host = port, key, model, host
        self.clients, self.total, self.max_seconds, self.pause = clients, total, max_seconds, pause
        self.max_tokens = max_tokens
        self.records: List[Dict] = []
        self._lock = threading.Lock()
        self._sent = 0
        self._threads: List[threading.Thread] = []
        self._deadline = 0.0

    def _next(self) -> bool:
        with self._lock:
            if self._sent >= self.total or time.time() >= self._deadline:
                return False
            self._sent += 1
            return True

    def one(self, timeout: float = 60.0) -> Dict:
        body = json.dumps({"model": self.model, "prompt": "hello fleet", "max_tokens": self.max_tokens})
        sent = time.time()
        record = {"sent": sent, "status": None, "replica": None, "error": None}
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                conn.request("POST", "/v1/completions", body=body, headers={
                    "Authorization": "Bearer " + self.key, "Content-Type": "application/json"})
                answer = conn.getresponse()
                data = answer.read()
                record["status"] = answer.status
                record["replica"] = answer.getheader("X-Llmgw-Replica")
                if answer.status != 200:
                    record["error"] = data.decode("utf-8", "replace")[:300]
            finally:
                conn.close()
        except (OSError, http.client.HTTPException) as exc:
            record["error"] = "%s: %s" % (type(exc).__name__, exc)
        record["done"] = time.time()
        return record

    def _client(self):
        while self._next():
            record = self.one()
            with self._lock:
                self.records.append(record)
            time.sleep(self.pause)

    def start(self) -> Load:
        self._deadline = time.time() + self.max_seconds
        self._threads = [threading.Thread(target=self._client, daemon=True) for _client in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> List[Dict]:
        """Wait for the load to end by itself (its count or its time limit); the records, in order sent."""
        for thread in self._threads:
            thread.join(timeout)
        return sorted(self.records, key=lambda r: r["sent"])

    def end_now(self):
        with self._lock:
            self._deadline = 0.0


def failures(records: List[Dict]) -> List[Dict]:
    return [r for r in records if r["status"] != 200]


def percentile(values: List[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]
