"""The ``deeppod`` command line. Built on the SDK; imports server code only inside ``deeppod server``."""
