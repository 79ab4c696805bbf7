"""Place names to IANA timezones, so "Tokyo", "NYC" or "the UK" can be answered without a geocoder.

Countries that span several zones map to their capital's zone. Any IANA name ("Asia/Kathmandu") or the
city part of one ("Kathmandu") also resolves, from the timezone database itself.
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from functools import cache

_CITIES = {
    # Americas
    "New York": "America/New_York", "Los Angeles": "America/Los_Angeles", "Chicago": "America/Chicago",
    "Houston": "America/Chicago", "Dallas": "America/Chicago", "Austin": "America/Chicago",
    "Phoenix": "America/Phoenix", "Denver": "America/Denver", "Seattle": "America/Los_Angeles",
    "San Francisco": "America/Los_Angeles", "San Diego": "America/Los_Angeles",
    "Las Vegas": "America/Los_Angeles", "Portland": "America/Los_Angeles", "Boston": "America/New_York",
    "Washington": "America/New_York", "Miami": "America/New_York", "Atlanta": "America/New_York",
    "Philadelphia": "America/New_York", "Detroit": "America/Detroit", "Minneapolis": "America/Chicago",
    "New Orleans": "America/Chicago", "Salt Lake City": "America/Denver", "Anchorage": "America/Anchorage",
    "Honolulu": "Pacific/Honolulu", "Toronto": "America/Toronto", "Montreal": "America/Toronto",
    "Ottawa": "America/Toronto", "Vancouver": "America/Vancouver", "Calgary": "America/Edmonton",
    "Edmonton": "America/Edmonton", "Winnipeg": "America/Winnipeg", "Halifax": "America/Halifax",
    "Mexico City": "America/Mexico_City", "Guadalajara": "America/Mexico_City", "Cancun": "America/Cancun",
    "Tijuana": "America/Tijuana", "Havana": "America/Havana", "Panama City": "America/Panama",
    "San Juan": "America/Puerto_Rico", "Bogota": "America/Bogota", "Lima": "America/Lima",
    "Quito": "America/Guayaquil", "Caracas": "America/Caracas", "Santiago": "America/Santiago",
    "Buenos Aires": "America/Argentina/Buenos_Aires", "Montevideo": "America/Montevideo",
    "Sao Paulo": "America/Sao_Paulo", "Rio de Janeiro": "America/Sao_Paulo", "Brasilia": "America/Sao_Paulo",
    "La Paz": "America/La_Paz", "Asuncion": "America/Asuncion",
    # Europe
    "London": "Europe/London", "Manchester": "Europe/London", "Edinburgh": "Europe/London",
    "Dublin": "Europe/Dublin", "Paris": "Europe/Paris", "Lyon": "Europe/Paris", "Marseille": "Europe/Paris",
    "Berlin": "Europe/Berlin", "Munich": "Europe/Berlin", "Hamburg": "Europe/Berlin",
    "Frankfurt": "Europe/Berlin", "Cologne": "Europe/Berlin", "Madrid": "Europe/Madrid",
    "Barcelona": "Europe/Madrid", "Lisbon": "Europe/Lisbon", "Porto": "Europe/Lisbon", "Rome": "Europe/Rome",
    "Milan": "Europe/Rome", "Naples": "Europe/Rome", "Venice": "Europe/Rome", "Florence": "Europe/Rome",
    "Amsterdam": "Europe/Amsterdam", "Rotterdam": "Europe/Amsterdam", "Brussels": "Europe/Brussels",
    "Luxembourg": "Europe/Luxembourg", "Zurich": "Europe/Zurich", "Geneva": "Europe/Zurich",
    "Vienna": "Europe/Vienna", "Prague": "Europe/Prague", "Warsaw": "Europe/Warsaw",
    "Krakow": "Europe/Warsaw",
    "Budapest": "Europe/Budapest", "Bucharest": "Europe/Bucharest", "Sofia": "Europe/Sofia",
    "Athens": "Europe/Athens", "Belgrade": "Europe/Belgrade", "Zagreb": "Europe/Zagreb",
    "Copenhagen": "Europe/Copenhagen", "Stockholm": "Europe/Stockholm", "Oslo": "Europe/Oslo",
    "Helsinki": "Europe/Helsinki", "Reykjavik": "Atlantic/Reykjavik", "Tallinn": "Europe/Tallinn",
    "Riga": "Europe/Riga", "Vilnius": "Europe/Vilnius", "Kyiv": "Europe/Kyiv", "Minsk": "Europe/Minsk",
    "Moscow": "Europe/Moscow", "Saint Petersburg": "Europe/Moscow", "Istanbul": "Europe/Istanbul",
    # Middle East and Africa
    "Ankara": "Europe/Istanbul", "Dubai": "Asia/Dubai", "Abu Dhabi": "Asia/Dubai", "Doha": "Asia/Qatar",
    "Riyadh": "Asia/Riyadh", "Jeddah": "Asia/Riyadh", "Kuwait City": "Asia/Kuwait", "Tehran": "Asia/Tehran",
    "Baghdad": "Asia/Baghdad", "Jerusalem": "Asia/Jerusalem", "Tel Aviv": "Asia/Jerusalem",
    "Beirut": "Asia/Beirut", "Amman": "Asia/Amman", "Cairo": "Africa/Cairo",
    "Casablanca": "Africa/Casablanca",
    "Tunis": "Africa/Tunis", "Algiers": "Africa/Algiers", "Lagos": "Africa/Lagos", "Accra": "Africa/Accra",
    "Dakar": "Africa/Dakar", "Nairobi": "Africa/Nairobi", "Addis Ababa": "Africa/Addis_Ababa",
    "Kinshasa": "Africa/Kinshasa", "Johannesburg": "Africa/Johannesburg", "Cape Town": "Africa/Johannesburg",
    # Asia and Oceania
    "Karachi": "Asia/Karachi", "Lahore": "Asia/Karachi", "Islamabad": "Asia/Karachi", "Kabul": "Asia/Kabul",
    "Mumbai": "Asia/Kolkata", "Delhi": "Asia/Kolkata", "New Delhi": "Asia/Kolkata",
    "Bangalore": "Asia/Kolkata", "Chennai": "Asia/Kolkata", "Kolkata": "Asia/Kolkata",
    "Hyderabad": "Asia/Kolkata", "Kathmandu": "Asia/Kathmandu", "Dhaka": "Asia/Dhaka",
    "Colombo": "Asia/Colombo", "Tashkent": "Asia/Tashkent", "Almaty": "Asia/Almaty",
    "Bangkok": "Asia/Bangkok", "Hanoi": "Asia/Bangkok", "Ho Chi Minh City": "Asia/Ho_Chi_Minh",
    "Kuala Lumpur": "Asia/Kuala_Lumpur", "Singapore": "Asia/Singapore", "Jakarta": "Asia/Jakarta",
    "Bali": "Asia/Makassar", "Manila": "Asia/Manila", "Hong Kong": "Asia/Hong_Kong", "Macau": "Asia/Macau",
    "Beijing": "Asia/Shanghai", "Shanghai": "Asia/Shanghai", "Shenzhen": "Asia/Shanghai",
    "Guangzhou": "Asia/Shanghai", "Chengdu": "Asia/Shanghai", "Taipei": "Asia/Taipei", "Seoul": "Asia/Seoul",
    "Busan": "Asia/Seoul", "Pyongyang": "Asia/Pyongyang", "Tokyo": "Asia/Tokyo", "Osaka": "Asia/Tokyo",
    "Kyoto": "Asia/Tokyo", "Ulaanbaatar": "Asia/Ulaanbaatar", "Vladivostok": "Asia/Vladivostok",
    "Sydney": "Australia/Sydney", "Melbourne": "Australia/Melbourne", "Brisbane": "Australia/Brisbane",
    "Perth": "Australia/Perth", "Adelaide": "Australia/Adelaide", "Canberra": "Australia/Sydney",
    "Darwin": "Australia/Darwin", "Hobart": "Australia/Hobart", "Auckland": "Pacific/Auckland",
    "Wellington": "Pacific/Auckland", "Fiji": "Pacific/Fiji",
}  # fmt: skip

_COUNTRIES = {
    "United States": "America/New_York", "Canada": "America/Toronto", "Mexico": "America/Mexico_City",
    "Cuba": "America/Havana", "Jamaica": "America/Jamaica", "Puerto Rico": "America/Puerto_Rico",
    "Guatemala": "America/Guatemala", "Costa Rica": "America/Costa_Rica", "Panama": "America/Panama",
    "Colombia": "America/Bogota", "Venezuela": "America/Caracas", "Ecuador": "America/Guayaquil",
    "Peru": "America/Lima", "Bolivia": "America/La_Paz", "Chile": "America/Santiago",
    "Argentina": "America/Argentina/Buenos_Aires", "Uruguay": "America/Montevideo",
    "Paraguay": "America/Asuncion", "Brazil": "America/Sao_Paulo", "United Kingdom": "Europe/London",
    "England": "Europe/London", "Scotland": "Europe/London", "Wales": "Europe/London",
    "Ireland": "Europe/Dublin", "France": "Europe/Paris", "Germany": "Europe/Berlin",
    "Spain": "Europe/Madrid",
    "Portugal": "Europe/Lisbon", "Italy": "Europe/Rome", "Netherlands": "Europe/Amsterdam",
    "Belgium": "Europe/Brussels", "Switzerland": "Europe/Zurich", "Austria": "Europe/Vienna",
    "Czech Republic": "Europe/Prague", "Poland": "Europe/Warsaw", "Hungary": "Europe/Budapest",
    "Romania": "Europe/Bucharest", "Bulgaria": "Europe/Sofia", "Greece": "Europe/Athens",
    "Serbia": "Europe/Belgrade", "Croatia": "Europe/Zagreb", "Denmark": "Europe/Copenhagen",
    "Sweden": "Europe/Stockholm", "Norway": "Europe/Oslo", "Finland": "Europe/Helsinki",
    "Iceland": "Atlantic/Reykjavik", "Estonia": "Europe/Tallinn", "Latvia": "Europe/Riga",
    "Lithuania": "Europe/Vilnius", "Ukraine": "Europe/Kyiv", "Belarus": "Europe/Minsk",
    "Russia": "Europe/Moscow", "Turkey": "Europe/Istanbul", "Israel": "Asia/Jerusalem",
    "Lebanon": "Asia/Beirut", "Jordan": "Asia/Amman", "Iraq": "Asia/Baghdad", "Iran": "Asia/Tehran",
    "Saudi Arabia": "Asia/Riyadh", "United Arab Emirates": "Asia/Dubai", "Qatar": "Asia/Qatar",
    "Kuwait": "Asia/Kuwait", "Egypt": "Africa/Cairo", "Morocco": "Africa/Casablanca",
    "Algeria": "Africa/Algiers", "Tunisia": "Africa/Tunis", "Nigeria": "Africa/Lagos",
    "Ghana": "Africa/Accra",
    "Senegal": "Africa/Dakar", "Kenya": "Africa/Nairobi", "Ethiopia": "Africa/Addis_Ababa",
    "South Africa": "Africa/Johannesburg", "Pakistan": "Asia/Karachi", "Afghanistan": "Asia/Kabul",
    "India": "Asia/Kolkata", "Nepal": "Asia/Kathmandu", "Bangladesh": "Asia/Dhaka",
    "Sri Lanka": "Asia/Colombo",
    "Kazakhstan": "Asia/Almaty", "Uzbekistan": "Asia/Tashkent", "Thailand": "Asia/Bangkok",
    "Vietnam": "Asia/Ho_Chi_Minh", "Malaysia": "Asia/Kuala_Lumpur", "Indonesia": "Asia/Jakarta",
    "Philippines": "Asia/Manila", "China": "Asia/Shanghai", "Taiwan": "Asia/Taipei",
    "South Korea": "Asia/Seoul", "North Korea": "Asia/Pyongyang", "Japan": "Asia/Tokyo",
    "Mongolia": "Asia/Ulaanbaatar", "Australia": "Australia/Sydney", "New Zealand": "Pacific/Auckland",
    # US states and Canadian provinces that people name instead of a city
    "California": "America/Los_Angeles", "Texas": "America/Chicago", "Florida": "America/New_York",
    "Hawaii": "Pacific/Honolulu", "Alaska": "America/Anchorage", "Arizona": "America/Phoenix",
    "Colorado": "America/Denver", "Illinois": "America/Chicago", "Ontario": "America/Toronto",
    "Quebec": "America/Toronto", "British Columbia": "America/Vancouver",
}  # fmt: skip

_ALIASES = {
    "nyc": "New York", "new york city": "New York", "ny": "New York", "manhattan": "New York",
    "brooklyn": "New York", "la": "Los Angeles", "l.a.": "Los Angeles", "sf": "San Francisco",
    "san fran": "San Francisco", "dc": "Washington", "washington dc": "Washington", "vegas": "Las Vegas",
    "philly": "Philadelphia", "rio": "Rio de Janeiro", "saint petersburg": "Saint Petersburg",
    "st petersburg": "Saint Petersburg", "kiev": "Kyiv", "bombay": "Mumbai", "calcutta": "Kolkata",
    "madras": "Chennai", "bengaluru": "Bangalore", "peking": "Beijing", "saigon": "Ho Chi Minh City",
    "bogotá": "Bogota", "são paulo": "Sao Paulo", "méxico": "Mexico", "zürich": "Zurich", "köln": "Cologne",
    "münchen": "Munich", "roma": "Rome", "praha": "Prague", "wien": "Vienna", "lisboa": "Lisbon",
    "uk": "United Kingdom", "u.k.": "United Kingdom", "britain": "United Kingdom",
    "great britain": "United Kingdom", "us": "United States", "u.s.": "United States",
    "usa": "United States", "u.s.a.": "United States", "america": "United States",
    "united states of america": "United States", "uae": "United Arab Emirates", "emirates": "Dubai",
    "holland": "Netherlands", "the netherlands": "Netherlands", "czechia": "Czech Republic",
    "korea": "South Korea", "republic of korea": "South Korea", "persia": "Iran", "türkiye": "Turkey",
    "turkiye": "Turkey", "prc": "China", "viet nam": "Vietnam",
}  # fmt: skip

_ZONES = {
    "UTC": "UTC", "Eastern Time": "America/New_York", "Central Time": "America/Chicago",
    "Mountain Time": "America/Denver", "Pacific Time": "America/Los_Angeles",
    "Central European Time": "Europe/Paris", "British Time": "Europe/London", "India Time": "Asia/Kolkata",
    "Japan Time": "Asia/Tokyo", "Korea Time": "Asia/Seoul", "Australian Eastern Time": "Australia/Sydney",
}  # fmt: skip

_ZONE_ALIASES = {
    "gmt": "UTC", "zulu": "UTC", "coordinated universal time": "UTC", "et": "Eastern Time",
    "est": "Eastern Time", "edt": "Eastern Time", "ct": "Central Time", "cst": "Central Time",
    "cdt": "Central Time", "mt": "Mountain Time", "mst": "Mountain Time", "mdt": "Mountain Time",
    "pt": "Pacific Time", "pst": "Pacific Time", "pdt": "Pacific Time", "cet": "Central European Time",
    "cest": "Central European Time", "bst": "British Time", "ist": "India Time", "jst": "Japan Time",
    "kst": "Korea Time", "aest": "Australian Eastern Time",
}  # fmt: skip

_CONTINENTS = {"africa", "america", "antarctica", "asia", "atlantic", "australia", "europe", "indian", "pacific"}

_WITH_THE = {"United States", "United Kingdom", "Netherlands", "Philippines", "United Arab Emirates",
             "Czech Republic"}  # fmt: skip


@dataclass(frozen=True)
class Place:
    """A resolved place: the name to say back and its IANA timezone."""

    name: str
    timezone: str

    @property
    def spoken(self) -> str:
        """The name as said after "in": "the United Kingdom", "Tokyo"."""
        return f"the {self.name}" if self.name in _WITH_THE else self.name


def _key(text: str) -> str:
    text = re.sub(r"\s+", " ", text.strip().lower().rstrip("?!.,"))
    return re.sub(r"^(?:the|in) ", "", text)


@cache
def _table() -> dict[str, Place]:
    """Every name we know, lower-cased: IANA zones first, so the curated names win on a clash."""
    table: dict[str, Place] = {}
    for zone in zoneinfo.available_timezones():
        if "/" in zone and not zone.startswith(("Etc/", "SystemV/")):
            city = zone.rsplit("/", 1)[1].replace("_", " ")
            table.setdefault(city.lower(), Place(city, zone))
            table[zone.lower()] = Place(city, zone)
    for name, zone in (_CITIES | _COUNTRIES | _ZONES).items():
        table[name.lower()] = Place(name, zone)
    for alias, name in (_ALIASES | _ZONE_ALIASES).items():
        table[alias] = table[name.lower()]
    return table


def resolve_place(text: str) -> Place | None:
    """The place a user named, or None when we do not know it."""
    key = _key(text)
    return _table().get(key) or _table().get(key.replace(".", ""))


def curated_places() -> tuple[str, ...]:
    """The cities and countries named here (aliases not counted), as the tools say them."""
    return (*_CITIES, *_COUNTRIES)


def database_places() -> tuple[str, ...]:
    """The cities only the timezone database names ("Tegucigalpa", from its zones' city parts), none of them curated:
    what a model trained on answers about curated places is measured on, as on names it never copied."""
    curated = {name.lower() for name in (*curated_places(), *_ZONES)} | set(_ALIASES) | set(_ZONE_ALIASES)
    return tuple(sorted({place.name for place in _table().values()
                         if place.timezone.split("/", 1)[0].lower() in _CONTINENTS and place.name.lower() not in curated
                         and re.fullmatch(r"[A-Z][a-z]+(?: [A-Z][a-z]+)*", place.name)}))
