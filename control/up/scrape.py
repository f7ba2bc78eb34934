"""Prometheus samples of every role, kept per process incarnation, so that the counters of an
instance that was killed (and restarted with fresh counters) still count in the totals."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

Samples = dict[str, float]  # 'name{labels}' -> value
MAX_EXPOSITION = 4 << 20


def parse_exposition(text: str) -> Samples:
    """The samples of a Prometheus text exposition (comments skipped, malformed lines ignored)."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


def total(samples: Mapping[str, float], name: str) -> float:
    """Sum of every sample of metric ``name`` (over all label sets)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def labelled(samples: Mapping[str, float], name: str, label: str, value: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(name + "{") and f'{label}="{value}"' in k)


def by_label(samples: Mapping[str, float], name: str, label: str) -> dict[str, float]:
    """The samples of metric ``name`` summed per value of ``label``; samples without it are left out."""
    pattern = re.compile(r'[{,]' + re.escape(label) + r'="([^"]*)"')
    out: dict[str, float] = {}
    for key, value in samples.items():
        if key.startswith(name + "{"):
            found = pattern.search(key)
            if found is not None:
                out[found.group(1)] = out.get(found.group(1), 0.0) + value
    return out


@dataclass
class Scraper:
    """Scrapes ``targets`` (name -> base URI) every ``every_s``; ``incarnation(name)`` tells restarts apart."""

    targets: Mapping[str, str]
    ssl_context: ssl.SSLContext
    incarnation: Callable[[str], int]
    every_s: float = 1.0
    latest: dict[tuple[str, int], Samples] = field(default_factory=dict)

    async def scrape_once(self, http: aiohttp.ClientSession) -> None:
        async def one(name: str, uri: str) -> None:
            incarnation = self.incarnation(name)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
                async with http.get(uri + "metrics", timeout=aiohttp.ClientTimeout(total=3)) as resp:
                    if resp.status == 200:
                        body = await resp.content.read(MAX_EXPOSITION)
                        self.latest[(name, incarnation)] = parse_exposition(body.decode())
        await asyncio.gather(*(one(n, u) for n, u in self.targets.items()))

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl_context)) as http:
            while not stop.is_set():
                await self.scrape_once(http)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.every_s)
            await self.scrape_once(http)

    def totals(self) -> dict[str, Samples]:
        """Per role name: each sample summed over the incarnations' last scrapes."""
        out: dict[str, Samples] = {}
        for (name, _), samples in self.latest.items():
            acc = out.setdefault(name, {})
            for key, value in samples.items():
                acc[key] = acc.get(key, 0.0) + value
        return out
