from deeppod.cli.main import main

main()
